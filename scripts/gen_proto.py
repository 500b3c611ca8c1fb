"""Generate the kubelet API stubs from proto/ into libs/ (or check them with --check).

    python scripts/gen_proto.py           # regenerate libs/vgpu/kubeletapi/**/api_pb2*.py
    python scripts/gen_proto.py --check   # exit 1 if the checked-in stubs differ from a fresh run

With ``-I proto`` protoc names the module ``vgpu.kubeletapi.v1beta1.api_pb2`` and writes absolute
imports, so the generated code imports without sys.path tricks.
"""

from __future__ import annotations

import argparse
import filecmp
import pathlib
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PROTOS = (
    pathlib.Path("vgpu/kubeletapi/v1beta1/api.proto"),  # device plugin
    pathlib.Path("vgpu/kubeletapi/pluginregistration/v1/api.proto"),  # plugins_registry handshake
    pathlib.Path("vgpu/kubeletapi/dra/v1/api.proto"),  # DRA kubelet plugin
    pathlib.Path("vgpu/kubeletapi/dra/v1beta1/api.proto"),
    pathlib.Path("vgpu/kubeletapi/drahealth/v1alpha1/api.proto"),  # DRA device health (KEP-4680)
)
OUT_DIR = ROOT / "libs"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_dir: pathlib.Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p) for p in PROTOS),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the checked-in stubs are stale")
    opts = parser.parse_args()
    if not opts.check:
        generate(OUT_DIR)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(pathlib.Path(tmp))
        stale = [
            str(proto.parent / name)
            for proto in PROTOS
            for name in GENERATED
            if not (OUT_DIR / proto.parent / name).exists()
            or not filecmp.cmp(
                pathlib.Path(tmp) / proto.parent / name, OUT_DIR / proto.parent / name, shallow=False
            )
        ]
    if stale:
        print(f"stale generated files (run scripts/gen_proto.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
