"""Scheduler extenders as kube-scheduler sees them: config, the filter/bind HTTP calls, result rules.

``parse_config`` reads the ``extenders`` list of a real KubeSchedulerConfiguration (v1beta2, v1beta3
and v1 share it; docs/protocol.md#the-extender-entry). ``parse_filter_result`` applies kube-scheduler's rules to an
ExtenderFilterResult (docs/protocol.md#how-kube-scheduler-calls-it): a non-empty ``Error`` fails the call; with ``nodeCacheCapable`` a non-null
``NodeNames`` must name only input nodes; otherwise ``Nodes`` supplies the survivors; otherwise none
survive. ``ExtenderClient`` does the POSTs with PascalCase ExtenderArgs / ExtenderBindingArgs, each
extender's connections kept as Go's transport keeps them (two idle at most), with each extender's
``httpTimeout``. Every failure is a ``SchedulingError`` whose
message reads like kube-scheduler's.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gzip
import json
import re
import ssl
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httptools

from vgpu.core import errors
from vgpu.localcluster import podresources

DEFAULT_TIMEOUT_S = 5.0  # kube-scheduler's DefaultExtenderTimeout, used for an unset or zero httpTimeout
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNIT_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


@dataclass(frozen=True)
class ManagedResource:
    name: str
    ignored_by_scheduler: bool = False


@dataclass(frozen=True)
class ExtenderConfig:
    """One ``extenders[]`` entry. The prioritize verb is read but not called."""

    url_prefix: str
    filter_verb: str = ""
    bind_verb: str = ""
    preempt_verb: str = ""
    node_cache_capable: bool = False
    http_timeout_s: float = DEFAULT_TIMEOUT_S
    ignorable: bool = False
    managed_resources: tuple[ManagedResource, ...] = ()
    enable_https: bool = False
    tls: Mapping[str, Any] = field(default_factory=dict)

    def url(self, verb: str) -> str:
        return self.url_prefix.rstrip("/") + "/" + verb

    def is_interested(self, pod: Mapping[str, Any]) -> bool:
        """kube-scheduler's ``IsInterested``: no managed resources means every pod."""
        if not self.managed_resources:
            return True
        wanted = {m.name for m in self.managed_resources}
        return bool(wanted & podresources.mentions(pod))


@dataclass(frozen=True)
class FilterResult:
    """The survivors of one extender's filter and its reasons for the rest."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


def parse_duration(raw: object, *, field: str) -> float:
    """A Go ``time.Duration`` string ("30s", "1m30s", "500ms", "0") as seconds."""
    if not isinstance(raw, str):
        raise errors.ConfigError(field, f"expected a duration string like '30s', got {raw!r}")
    text = raw.strip()
    if text in ("0", "+0", "-0"):
        return 0.0
    body = text.lstrip("+-")
    parts = _DURATION_PART.findall(body)
    if not body or "".join(num + unit for num, unit in parts) != body:
        raise errors.ConfigError(field, f"invalid duration {raw!r}: expected e.g. '5s', '1m30s', '500ms'")
    seconds = sum(float(num) * _DURATION_UNIT_S[unit] for num, unit in parts)
    if text.startswith("-"):
        raise errors.ConfigError(field, f"invalid duration {raw!r}: must not be negative")
    return seconds


def _bool(entry: Mapping[str, Any], key: str, prefix: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise errors.ConfigError(f"{prefix}.{key}", f"expected true or false, got {value!r}")
    return value


def _str(entry: Mapping[str, Any], key: str, prefix: str) -> str:
    value = entry.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise errors.ConfigError(f"{prefix}.{key}", f"expected a string, got {value!r}")
    return value


def _parse_one(entry: object, prefix: str) -> ExtenderConfig:
    if not isinstance(entry, Mapping):
        raise errors.ConfigError(prefix, f"expected a mapping, got {entry!r}")
    url_prefix = _str(entry, "urlPrefix", prefix)
    if not url_prefix.startswith(("http://", "https://")):
        raise errors.ConfigError(f"{prefix}.urlPrefix", f"required http(s) URL, got {url_prefix!r}")
    timeout_s = DEFAULT_TIMEOUT_S
    if entry.get("httpTimeout") is not None:
        timeout_s = parse_duration(entry["httpTimeout"], field=f"{prefix}.httpTimeout") or DEFAULT_TIMEOUT_S
    managed: list[ManagedResource] = []
    raw_managed = entry.get("managedResources")
    raw_managed = [] if raw_managed is None else raw_managed
    if not isinstance(raw_managed, list):
        raise errors.ConfigError(f"{prefix}.managedResources", f"expected a list, got {raw_managed!r}")
    for j, item in enumerate(raw_managed):
        where = f"{prefix}.managedResources[{j}]"
        if not isinstance(item, Mapping):
            raise errors.ConfigError(where, f"expected a mapping with name, got {item!r}")
        name = _str(item, "name", where)
        if not podresources.is_extended_resource_name(name):
            raise errors.ConfigError(f"{where}.name", f"{name!r} is not an extended resource name")
        managed.append(ManagedResource(name, _bool(item, "ignoredByScheduler", where)))
    tls = entry.get("tlsConfig")
    tls = {} if tls is None else tls
    if not isinstance(tls, Mapping):
        raise errors.ConfigError(f"{prefix}.tlsConfig", f"expected a mapping, got {tls!r}")
    return ExtenderConfig(
        url_prefix=url_prefix,
        filter_verb=_str(entry, "filterVerb", prefix),
        bind_verb=_str(entry, "bindVerb", prefix),
        preempt_verb=_str(entry, "preemptVerb", prefix),
        node_cache_capable=_bool(entry, "nodeCacheCapable", prefix),
        http_timeout_s=timeout_s,
        ignorable=_bool(entry, "ignorable", prefix),
        managed_resources=tuple(managed),
        enable_https=_bool(entry, "enableHTTPS", prefix),
        tls=dict(tls),
    )


def parse_config(raw: Mapping[str, Any] | None) -> tuple[ExtenderConfig, ...]:
    """The extenders of a KubeSchedulerConfiguration dict, validated as kube-scheduler does."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise errors.ConfigError("KubeSchedulerConfiguration", f"expected a mapping, got {raw!r}")
    entries = raw.get("extenders")
    entries = [] if entries is None else entries
    if not isinstance(entries, list):
        raise errors.ConfigError("extenders", f"expected a list, got {entries!r}")
    parsed = tuple(_parse_one(entry, f"extenders[{i}]") for i, entry in enumerate(entries))
    if sum(1 for e in parsed if e.bind_verb) > 1:
        raise errors.ConfigError("extenders", "only one extender can implement bind, found more")
    seen: set[str] = set()
    for i, ext in enumerate(parsed):
        for managed in ext.managed_resources:
            if managed.name in seen:
                raise errors.ConfigError(
                    f"extenders[{i}].managedResources",
                    f"duplicate extender managed resource {managed.name!r}",
                )
            seen.add(managed.name)
    return parsed


def _key(raw: Mapping[str, Any], name: str) -> Any:
    """Go's decoder: the exact key first, else a case-insensitive match."""
    if name in raw:
        return raw[name]
    lowered = name.lower()
    for key, value in raw.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


def _reason_map(raw: object, what: str, url: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise errors.SchedulingError(
            f"decoding filter result from extender at URL {url}: {what} must map names to reasons"
        )
    return dict(raw)


def parse_filter_result(
    raw: object,
    *,
    url: str,
    input_nodes: Sequence[str],
    node_cache_capable: bool,
    extender_url: str | None = None,
) -> FilterResult:
    """ExtenderFilterResult → survivors and reasons, by kube-scheduler's rules (docs/protocol.md#how-kube-scheduler-calls-it).

    ``url`` is the filter URL (named in decoding errors); ``extender_url`` the ``urlPrefix``, which
    kube-scheduler names when the extender claims a node it was not sent."""
    if not isinstance(raw, Mapping):
        raise errors.SchedulingError(f"decoding filter result from extender at URL {url}: not a JSON object")
    error = _key(raw, "Error")
    if error not in (None, ""):
        raise errors.SchedulingError(str(error))
    failed = _reason_map(_key(raw, "FailedNodes"), "FailedNodes", url)
    unresolvable = _reason_map(_key(raw, "FailedAndUnresolvableNodes"), "FailedAndUnresolvableNodes", url)
    names = _key(raw, "NodeNames")
    nodes = _key(raw, "Nodes")
    passed: list[str] = []
    if node_cache_capable and names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise errors.SchedulingError(
                f"decoding filter result from extender at URL {url}: NodeNames must be a list of strings"
            )
        known = set(input_nodes)
        for name in names:
            if name not in known:
                raise errors.SchedulingError(
                    f'extender "{extender_url or url}" claims a filtered node "{name}" '
                    "which is not found in the input node list"
                )
        passed = list(names)
    elif nodes is not None:
        items = _key(nodes, "items") if isinstance(nodes, Mapping) else None
        if not isinstance(items, list | None):
            raise errors.SchedulingError(
                f"decoding filter result from extender at URL {url}: Nodes.items must be a list"
            )
        for item in items or []:
            name = ((item or {}).get("metadata") or {}).get("name") if isinstance(item, Mapping) else None
            if not isinstance(name, str):
                raise errors.SchedulingError(
                    f"decoding filter result from extender at URL {url}: a node in Nodes has no name"
                )
            passed.append(name)
    return FilterResult(passed=passed, failed=failed, unresolvable=unresolvable)


def _ssl_context(ext: ExtenderConfig) -> ssl.SSLContext:
    """kube-scheduler's transport for an https URL: with ``enableHTTPS`` the extender's
    ``tlsConfig``, where HTTPS without a CA skips verification; without it Go's defaults."""
    if not ext.enable_https:
        return ssl.create_default_context()
    has_ca = bool(ext.tls.get("caFile") or ext.tls.get("caData"))
    if ext.tls.get("insecure") or not has_ca:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=ext.tls.get("caFile") or None)
    if ext.tls.get("caData"):
        try:
            context.load_verify_locations(cadata=base64.b64decode(ext.tls["caData"]).decode())
        except (binascii.Error, ValueError, ssl.SSLError) as err:
            raise errors.ConfigError("tlsConfig.caData", f"not a base64 PEM certificate: {err}") from err
    if ext.tls.get("certFile") and ext.tls.get("keyFile"):
        context.load_cert_chain(ext.tls["certFile"], ext.tls["keyFile"])
    return context


# net/http's DefaultMaxIdleConnsPerHost, which kube-scheduler's extender transport keeps
# (utilnet.SetTransportDefaults sets no other): of the connections its calls give back, two stay open
GO_MAX_IDLE_CONNS_PER_HOST = 2


class _Eof(ConnectionError):
    """The server closed the connection before its answer was complete (Go's ``EOF``)."""


class GoConnection(asyncio.Protocol):
    """One HTTP/1.1 client connection, a request at a time, as a Go ``persistConn``: the request
    written in one go, the answer parsed by ``httptools`` (llhttp) as it arrives. A lean client on
    purpose: Go's costs some tens of microseconds of CPU a call, and the emulated kube-scheduler
    makes the ``/filter`` call inside its serial cycle, so a heavier client (aiohttp's, a session
    per connection) would put CPU that the real one does not spend into every GPU pod's cycle."""

    def __init__(self) -> None:
        self.transport: asyncio.BaseTransport | None = None
        self.closed = False
        self.lost = asyncio.Event()  # set with ``closed``, once the connection is gone
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._body: list[bytes] = []
        self._gzip = False

    # ----- asyncio.Protocol -----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(ConnectionError(f"malformed HTTP response: {err}"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost.set()
        self._fail(exc if exc is not None else _Eof("EOF"))

    # ----- httptools callbacks -----

    def on_message_begin(self) -> None:
        self._body, self._gzip = [], False

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-encoding" and value.strip().lower() == b"gzip":
            self._gzip = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self._body)
        if self._gzip:  # Go's transport asks for gzip and undoes it
            body = gzip.decompress(body)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self._parser.get_status_code(), body, self._parser.should_keep_alive()))

    # ----- the client's side -----

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    async def request(self, data: bytes) -> tuple[int, bytes, bool]:
        """Send one whole request; its answer's status, body and whether the connection may be kept."""
        if self.closed or not isinstance(self.transport, asyncio.WriteTransport):
            raise _Eof("EOF")
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self._waiter

    def abort(self) -> None:
        self.closed = True
        if isinstance(self.transport, asyncio.WriteTransport):
            self.transport.abort()


class GoConnections:
    """One extender's connections as Go's ``http.Transport`` keeps them for kube-scheduler: each
    call in flight on a connection of its own (the most recently idle one, else a new one), and of
    those given back at most ``GO_MAX_IDLE_CONNS_PER_HOST`` kept open, the rest closed; one the
    server closed while idle is dropped (Go's read loop sees its EOF). So, as with a real
    kube-scheduler, concurrent binds make it dial for many later calls."""

    def __init__(self, ext: ExtenderConfig) -> None:
        parts = urllib.parse.urlsplit(ext.url_prefix)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if self.https else 80)
        self.authority = parts.netloc
        self._ssl = _ssl_context(ext) if self.https else None  # none to load for plain HTTP
        self._heads: dict[str, bytes] = {}  # URL -> its request line and fixed headers
        self.idle: list[GoConnection] = []
        self.dials = 0  # connections opened so far
        self.closed = False

    async def take(self) -> GoConnection:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        self.dials += 1
        try:
            _, conn = await asyncio.get_running_loop().create_connection(
                GoConnection,
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self.host if self._ssl is not None else None,
            )
        except ConnectionRefusedError as err:
            raise ConnectionError(f"dial tcp {self.host}:{self.port}: connect: connection refused") from err
        except OSError as err:
            raise ConnectionError(f"dial tcp {self.host}:{self.port}: {err.strerror or err}") from err
        return conn

    def request(self, url: str, payload: bytes) -> bytes:
        """A POST of ``payload`` to ``url`` as Go's client writes it."""
        head = self._heads.get(url)
        if head is None:
            parts = urllib.parse.urlsplit(url)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            head = self._heads[url] = (
                f"POST {target} HTTP/1.1\r\nHost: {self.authority}\r\nUser-Agent: Go-http-client/1.1\r\n"
                "Content-Type: application/json\r\nAccept-Encoding: gzip\r\nContent-Length: "
            ).encode()
        return head + b"%d\r\n\r\n" % len(payload) + payload

    def give_back(self, conn: GoConnection, *, reusable: bool) -> None:
        if reusable and not conn.closed and not self.closed and len(self.idle) < GO_MAX_IDLE_CONNS_PER_HOST:
            self.idle.append(conn)
        else:
            conn.abort()

    async def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.abort()


class ExtenderClient:
    """The HTTP side of the extenders of one scheduler: each extender's connections kept as
    kube-scheduler's Go transport keeps them (``GoConnections``), the request as Go writes it."""

    def __init__(self, extenders: Sequence[ExtenderConfig]) -> None:
        self.extenders = tuple(extenders)
        self.connections = {id(ext): GoConnections(ext) for ext in self.extenders}

    async def close(self) -> None:
        for connections in self.connections.values():
            await connections.close()

    async def _post(self, ext: ExtenderConfig, verb: str, body: Mapping[str, Any]) -> Any:
        url = ext.url(verb)
        payload = json.dumps(body).encode()
        connections = self.connections[id(ext)]
        request = connections.request(url, payload)
        conn: GoConnection | None = None
        reusable = False  # a call that failed leaves its connection closed, as Go's does
        try:
            async with asyncio.timeout(ext.http_timeout_s):
                conn = await connections.take()
                status, data, keep_alive = await conn.request(request)
                # kube-scheduler closes a non-200 answer's body unread, and Go then drops the connection
                reusable = keep_alive and status == 200
        except TimeoutError as err:  # worded as Go's http.Client says it
            raise errors.SchedulingError(
                f'Post "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
            ) from err
        except ConnectionError as err:
            raise errors.SchedulingError(f'Post "{url}": {err}') from err
        finally:
            if conn is not None:
                connections.give_back(conn, reusable=reusable)
        if status != 200:
            raise errors.SchedulingError(f"failed {verb} with extender at URL {url}, code {status}")
        try:
            return json.loads(data)
        except ValueError as err:
            raise errors.SchedulingError(f"decoding {verb} result from extender at URL {url}: {err}") from err

    async def filter(
        self,
        ext: ExtenderConfig,
        pod: Mapping[str, Any],
        names: Sequence[str],
        nodes: Sequence[Mapping[str, Any]] = (),
    ) -> FilterResult:
        """POST ExtenderArgs to the filter verb; with no filterVerb every node passes. ``nodes``:
        the Node objects of ``names``, sent only to an extender that is not nodeCacheCapable."""
        names = list(names)
        if not ext.filter_verb:
            return FilterResult(passed=names, failed={}, unresolvable={})
        args: dict[str, Any] = {"Pod": pod, "Nodes": None, "NodeNames": None}
        if ext.node_cache_capable:
            args["NodeNames"] = names
        else:
            args["Nodes"] = {"metadata": {}, "items": list(nodes)}
        raw = await self._post(ext, ext.filter_verb, args)
        return parse_filter_result(
            raw,
            url=ext.url(ext.filter_verb),
            input_nodes=names,
            node_cache_capable=ext.node_cache_capable,
            extender_url=ext.url_prefix,
        )

    async def preempt(
        self, ext: ExtenderConfig, pod: Mapping[str, Any], victims: Mapping[str, Sequence[Mapping[str, Any]]]
    ) -> dict[str, list[str]]:
        """POST ExtenderPreemptionArgs (UIDs when nodeCacheCapable, else whole pods); the answer's
        ``NodeNameToMetaVictims`` as node -> victim UIDs (checking them is the caller's part)."""
        if ext.node_cache_capable:
            meta = {
                node: {"Pods": [{"UID": p["metadata"]["uid"]} for p in pods], "NumPDBViolations": 0}
                for node, pods in victims.items()
            }
            args: dict[str, Any] = {"Pod": pod, "NodeNameToMetaVictims": meta}
        else:
            full = {node: {"Pods": list(pods), "NumPDBViolations": 0} for node, pods in victims.items()}
            args = {"Pod": pod, "NodeNameToVictims": full}
        raw = await self._post(ext, ext.preempt_verb, args)
        url = ext.url(ext.preempt_verb)
        answer = _key(raw, "NodeNameToMetaVictims") if isinstance(raw, Mapping) else None
        if not isinstance(raw, Mapping) or not isinstance(answer, Mapping | None):
            raise errors.SchedulingError(f"decoding preempt result from extender at URL {url}: not a result")
        out: dict[str, list[str]] = {}
        for node, got in (answer or {}).items():
            pods = _key(got, "Pods") if isinstance(got, Mapping) else None
            uids = [_key(p, "UID") for p in pods or [] if isinstance(p, Mapping)]
            if not isinstance(pods, list | None) or not all(isinstance(u, str) for u in uids):
                raise errors.SchedulingError(
                    f"decoding preempt result from extender at URL {url}: bad victims for node {node}"
                )
            out[str(node)] = [str(u) for u in uids]
        return out

    async def bind(self, ext: ExtenderConfig, pod: Mapping[str, Any], node: str) -> None:
        """POST ExtenderBindingArgs; a non-empty ``Error`` is a failure."""
        meta = pod.get("metadata") or {}
        args = {
            "PodName": meta.get("name", ""),
            "PodNamespace": meta.get("namespace", "default"),
            "PodUID": meta.get("uid", ""),
            "Node": node,
        }
        raw = await self._post(ext, ext.bind_verb, args)
        if not isinstance(raw, Mapping):
            url = ext.url(ext.bind_verb)
            raise errors.SchedulingError(
                f"decoding bind result from extender at URL {url}: not a JSON object"
            )
        error = _key(raw, "Error")
        if error not in (None, ""):
            raise errors.SchedulingError(str(error))
