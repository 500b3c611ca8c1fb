"""The DRA kubelet plugin through real unix-socket gRPC: kubelet's registration handshake, then
NodePrepareResources / NodeUnprepareResources in v1 and v1beta1, each claim answered (its error
in the answer, never a failed call), the CDI spec written and removed."""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from vgpu.core import errors
from vgpu.core.dra import names
from vgpu_device_plugin import dirwatch
from vgpu_device_plugin.dra import prepare, registrar, service

from tests.device_plugin.builders import short_tmp
from tests.device_plugin.dra import claims as c
from tests.device_plugin.dra.fakedrakubelet import FakeDraKubelet

UID_A = "aaaa1111-0000-0000-0000-000000000001"
UID_B = "bbbb2222-0000-0000-0000-000000000002"
SHARE_B = "5ea7e000-0000-4000-8000-00000000000b"


@dataclass
class Plugin:
    root: pathlib.Path
    claims: c.FakeClaims
    preparer: prepare.Preparer
    reg: registrar.Registrar
    server: service.DraServer


@pytest.fixture
async def plugin() -> AsyncIterator[Plugin]:
    root = short_tmp()
    claims = c.FakeClaims(
        c.claim("one", UID_A),
        c.claim(
            "two",
            UID_B,
            c.result(device="gpu-1", consumedCapacity={"memory": "2Gi"}, shareID=SHARE_B),
        ),
    )
    prep = c.preparer(root, claims)
    await prep.start()
    server = service.DraServer(prep, root / "plugins" / names.DRA_SOCKET)
    await server.start()
    reg = registrar.Registrar(
        registrar.RegistrationService(driver=names.DRIVER, endpoint=server.socket_path),
        root / "registry" / names.REGISTRATION_SOCKET,
        watcher=dirwatch.NoWatcher(),
        node=c.NODE,
    )
    await reg.start()
    try:
        yield Plugin(root, claims, prep, reg, server)
    finally:
        await reg.stop()
        await server.stop(grace_s=0)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(
    "kubelet_knows", [("v1.DRAPlugin", "v1beta1.DRAPlugin"), ("v1beta1.DRAPlugin",)], ids=["v1", "v1beta1"]
)
async def test_kubelet_registers_the_plugin_and_prepares_and_unprepares_claims(
    plugin: Plugin, kubelet_knows: tuple[str, ...]
) -> None:
    kubelet = FakeDraKubelet(services=kubelet_knows)
    try:
        chosen = await kubelet.register(plugin.reg.socket_path)
        assert chosen == kubelet_knows[0]
        assert kubelet.info is not None
        assert (kubelet.info.type, kubelet.info.name, kubelet.info.endpoint) == (
            "DRAPlugin",
            "gpu.kube-vgpu.io",
            str(plugin.server.socket_path),
        )
        assert list(kubelet.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        assert plugin.reg.service.registered

        answer = await kubelet.prepare((UID_A, "ns", "one"), (UID_B, "ns", "two"))
        assert set(answer.claims) == {UID_A, UID_B}
        a, b = answer.claims[UID_A], answer.claims[UID_B]
        assert (a.error, b.error) == ("", "")
        (dev_a,) = a.devices
        assert (
            list(dev_a.request_names),
            dev_a.pool_name,
            dev_a.device_name,
            list(dev_a.cdi_device_ids),
        ) == (
            ["gpu"],
            c.NODE,
            "gpu-0",
            [f"kube-vgpu.io/claim={UID_A}-gpu"],
        )
        if chosen == "v1.DRAPlugin":
            assert dev_a.share_id == c.SHARE_0 and b.devices[0].share_id == SHARE_B
        spec = json.loads(c.spec_path(plugin.root, UID_B).read_text())
        env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == c.UUID_1
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
        assert "CUDA_DEVICE_SM_LIMIT" not in env  # cores defaulted to 0: no SM limit
        cache = c.cache_dir(plugin.root, UID_B)
        assert cache.is_dir() and cache.stat().st_mode & 0o777 == 0o777

        again = await kubelet.prepare((UID_A, "ns", "one"))
        assert again.claims[UID_A] == a  # a retried Prepare: the same answer
        assert plugin.claims.reads == 2  # ...from the checkpoint, not the API server

        done = await kubelet.unprepare((UID_A, "ns", "one"), (UID_B, "ns", "two"))
        assert {u: r.error for u, r in done.claims.items()} == {UID_A: "", UID_B: ""}
        assert not c.spec_path(plugin.root, UID_A).exists() and not cache.exists()
        assert plugin.preparer.prepared == {}
    finally:
        await kubelet.close()


async def test_a_kubelet_that_knows_no_version_of_ours_refuses_and_the_plugin_logs_why(
    plugin: Plugin, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet = FakeDraKubelet(services=("v1alpha4.Node",))
    assert await kubelet.register(plugin.reg.socket_path) == ""
    assert not plugin.reg.service.registered
    assert "kubelet refused DRA driver gpu.kube-vgpu.io" in caplog.text
    assert "none of services supported by the plugin" in caplog.text


async def test_garbage_claims_each_get_their_error_and_the_others_are_prepared(plugin: Plugin) -> None:
    other_node = "cccc3333-0000-0000-0000-000000000003"
    other_driver = "dddd4444-0000-0000-0000-000000000004"
    unknown_gpu = "eeee5555-0000-0000-0000-000000000005"
    unallocated = "ffff6666-0000-0000-0000-000000000006"
    for name, uid, results in [
        ("elsewhere", other_node, [c.result(pool="gpu-node-2")]),
        ("nvidia", other_driver, [c.result(driver="gpu.nvidia.com")]),
        ("gpu9", unknown_gpu, [c.result(device="gpu-9")]),
    ]:
        plugin.claims.claims[("ns", name)] = c.claim(name, uid, *results)
    bare = c.claim("bare", unallocated)
    del bare["status"]
    plugin.claims.claims[("ns", "bare")] = bare
    kubelet = FakeDraKubelet()
    try:
        await kubelet.register(plugin.reg.socket_path)
        answer = await kubelet.prepare(
            (UID_A, "ns", "one"),
            ("9999aaaa-0000-0000-0000-00000000000f", "ns", "one"),  # the name now holds another claim
            ("12345678-0000-0000-0000-000000000000", "ns", "deleted"),
            (other_node, "ns", "elsewhere"),
            (other_driver, "ns", "nvidia"),
            (unknown_gpu, "ns", "gpu9"),
            (unallocated, "ns", "bare"),
            ("../../etc", "ns", "one"),
            ("0000aaaa-0000-0000-0000-000000000000", "", "one"),
        )
        errors_by_uid = {u: r.error for u, r in answer.claims.items()}
        assert errors_by_uid.pop(UID_A) == ""
        assert len(errors_by_uid) == 8
        expected = {
            "9999aaaa-0000-0000-0000-00000000000f": "the API server has UID",
            "12345678-0000-0000-0000-000000000000": "not on the API server",
            other_node: "allocated in pool(s) ['gpu-node-2']",
            other_driver: "no device of driver gpu.kube-vgpu.io",
            unknown_gpu: "'gpu-9' (request gpu) is not a GPU of this node",
            unallocated: "the claim is not allocated",
            "../../etc": "is not a Kubernetes UID",
            "0000aaaa-0000-0000-0000-000000000000": "kubelet named no namespace or no name",
        }
        for uid, why in expected.items():
            assert why in errors_by_uid[uid], (uid, errors_by_uid[uid])
            assert not answer.claims[uid].devices
        assert set(plugin.preparer.prepared) == {UID_A}
        assert not any(p.name.endswith(f"{other_node}.json") for p in (plugin.root / "var/run/cdi").iterdir())
    finally:
        await kubelet.close()


async def test_an_api_failure_is_the_claims_error_and_a_retry_prepares_it(plugin: Plugin) -> None:
    kubelet = FakeDraKubelet()
    try:
        await kubelet.register(plugin.reg.socket_path)
        plugin.claims.fail = errors.KubeError("connection refused", status=0)
        first = await kubelet.prepare((UID_A, "ns", "one"))
        assert "reading it from the API server failed: connection refused" in first.claims[UID_A].error
        plugin.claims.fail = None
        second = await kubelet.prepare((UID_A, "ns", "one"))
        assert second.claims[UID_A].error == "" and len(second.claims[UID_A].devices) == 1
    finally:
        await kubelet.close()


async def test_unprepare_of_a_claim_never_prepared_succeeds(plugin: Plugin) -> None:
    kubelet = FakeDraKubelet()
    try:
        await kubelet.register(plugin.reg.socket_path)
        done = await kubelet.unprepare(("77777777-0000-0000-0000-000000000007", "ns", "x"))
        assert done.claims["77777777-0000-0000-0000-000000000007"].error == ""
        bad = await kubelet.unprepare(("../x", "ns", "x"))
        assert "is not a Kubernetes UID" in bad.claims["../x"].error
    finally:
        await kubelet.close()


async def test_missing_hami_core_refuses_the_claim_with_the_remedy(plugin: Plugin) -> None:
    (plugin.root / "usr/local/vgpu/libvgpu.so").unlink()
    kubelet = FakeDraKubelet()
    try:
        await kubelet.register(plugin.reg.socket_path)
        answer = await kubelet.prepare((UID_A, "ns", "one"))
        assert "libvgpu.so is missing on the host" in answer.claims[UID_A].error
        assert not c.spec_path(plugin.root, UID_A).exists()
    finally:
        await kubelet.close()
