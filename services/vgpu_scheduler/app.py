"""``SchedulerService``: the vgpu-scheduler's composition and lifecycle, on two listeners.

* **extender** (``routes.EXTENDER_ROUTES``: ``/filter``, ``/bind``, ``/preempt``) on 127.0.0.1
  only: kube-scheduler runs in the same pod and is the only caller these verbs may have, since they
  write decisions, node locks and Bindings with the scheduler's cluster-wide rights. Plain HTTP:
  the traffic never leaves the pod's network namespace.
* **service** (``routes.SERVICE_ROUTES``: ``/webhook``, ``/healthz``, ``/readyz``, ``/metrics`` and
  the read-only dashboard ``/ui``, ``/ui/state``, ``/ui/events``, see ``ui.py``) on the Service
  port (``--host``/``--port``, HTTPS with the serving certificate). ``/filter``, ``/bind`` and
  ``/preempt`` are 404 there. ``/metrics`` and the dashboard need a bearer token the cluster
  authenticates and authorizes unless ``scheduler.viewsAuth`` is ``none`` (``viewaccess.py``).

Both listeners bound connections, time out handshakes, heads and bodies and cap body sizes
(``listener.py``; the caps in ``limits.py``). The extender's is a server of its own
(``extender_http.py``), which answers ``/filter`` in the loop callback that reads the request.
``SchedulerService`` builds the ``Services`` group (``routes.py``) from a Config and a KubeApi,
runs the watches that feed the state, serves both listeners and tears everything down in order;
``main.py`` only adds flags and signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import ssl
import time
from collections.abc import Callable

from aiohttp import web
from vgpu import gcfreeze
from vgpu.core import errors, request
from vgpu.core.config import Config, ViewsAuth
from vgpu.kube import informer
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_scheduler import draviews, listener, ui, viewaccess, watches
from vgpu_scheduler import limits as limits_mod
from vgpu_scheduler import load as load_mod
from vgpu_scheduler import state as state_mod
from vgpu_scheduler.binder import Binder
from vgpu_scheduler.budgets import Budgets
from vgpu_scheduler.dratemplates import DraTemplates
from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.extender import Extender
from vgpu_scheduler.metrics import Metrics
from vgpu_scheduler.preempt import Preempter
from vgpu_scheduler.priorities import PriorityClasses
from vgpu_scheduler.retries import FilterRetries
from vgpu_scheduler.routes import Services, build_extender_server, build_service_app
from vgpu_scheduler.selfpreempt import SelfPreemption
from vgpu_scheduler.webhook import Webhook

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 2.0  # requests still running at shutdown get this long, then are cancelled
# (aiohttp then waits as long again for the cancelled handlers' clean-up)
GC_CHECK_S = 30.0  # how often the frozen objects are counted, for an idle compaction (gcfreeze.py)
GC_MEMORY_CHECK_S = 1.0  # how often the resident set is held to its bound (gcfreeze.Bounds)
GC_BOUNDS = gcfreeze.Bounds()


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class SchedulerService:
    """The whole extender process minus flags: state, watches, HTTP server."""

    def __init__(
        self,
        config: Config,
        api: KubeApi,
        *,
        clock: Callable[[], float] = time.time,
        wall_clock: Callable[[], datetime.datetime] = _utc_now,
        limits: limits_mod.ListenerLimits | None = None,
        api_pool: load_mod.PoolBacklog | None = None,
        gc: gcfreeze.SurvivorFreezer | None = None,
        gc_bounds: gcfreeze.Bounds = GC_BOUNDS,
        gc_check_s: float = GC_CHECK_S,
        gc_memory_check_s: float = GC_MEMORY_CHECK_S,
    ) -> None:
        """``api_pool`` is the API adapter's call pool, for readiness (None: not checked); ``gc``
        keeps long-lived objects out of the collector's scans once synced, compacted within
        ``gc_bounds``: the frozen objects are counted every ``gc_check_s`` (``gc_check``), the
        resident set compared every ``gc_memory_check_s`` (``gc_memory_check``)."""
        self.config = config
        self.limits = limits or limits_mod.ListenerLimits()
        self.api = api
        name = config.scheduler.scheduler_name
        self.events = EventRecorder(api, component=name)
        self.lag_probe = load_mod.LoopLagProbe()
        # installed once synced: filter p99 without full-collection stalls
        self.gc = gc or gcfreeze.SurvivorFreezer()
        self.gc_compacted = asyncio.Event()  # set after each compaction (for tests and the curious)
        self._gc_bounds = gc_bounds
        self._gc_check_s = gc_check_s
        self._gc_memory_check_s = gc_memory_check_s
        self._gc_seen_calls = 0  # hot-path calls at the last gc_check
        load = load_mod.Load(probe=self.lag_probe, pool=api_pool)

        def node_warning(node: dict[str, object], reason: str, message: str) -> None:
            with contextlib.suppress(RuntimeError):  # no running loop: only in unit tests
                self.events.emit(_node_ref(node), reason=reason, message=message, type="Warning")

        self.state = state_mod.ClusterState(config, clock=clock, on_node_warning=node_warning)
        self.informers = watches.informers(api, self.state)
        self.budgets = Budgets()  # PodDisruptionBudgets, for /preempt

        def on_budget(change: informer.Change) -> None:
            self.budgets.apply(change.type, change.object)

        # policy/v1 is served from Kubernetes 1.21: before it, preemption honours no budgets, and
        # the scheduler still becomes ready
        self.informers.append(
            informer.Informer(api, "poddisruptionbudgets", on_event=on_budget, unserved_ok=True)
        )
        self.priorities = PriorityClasses()  # a preemptor's priority as the cluster has it

        def on_priority_class(change: informer.Change) -> None:
            self.priorities.apply(change.type, change.object)

        self.informers.append(informer.Informer(api, "priorityclasses", on_event=on_priority_class))
        # the DRA mode's claim templates and GPU sizes (served from Kubernetes 1.34's resource.k8s.io/v1)
        self.dra_templates = DraTemplates(
            api, wait_s=config.webhook.dra_template_wait_s, on_template=self.state.dra.template
        )
        self.informers += self.dra_templates.informers()
        sizes = self.dra_templates.memory_sizes_mib
        largest = self.state.inventory.largest_gpu_memory_mib
        self.state.dra.largest_gpu_memory_mib = lambda: max(largest(), *sizes(), 0)
        # the DRA mode's slices and claims, for the views: not in the state /filter reads; the
        # slices' informer (waited for by readiness) also tells the webhook's GPU sizes
        self.dra = draviews.DraViews(
            api, on_slice=self.dra_templates.slice_changed, templates=self.dra_templates.templates.items
        )
        self.informers.append(self.dra.slices)
        # watches only the views read (readiness does not wait for them)
        self.view_informers: list[informer.Informer] = [self.dra.claims]
        extender = Extender(config=config, state=self.state, events=self.events, clock=clock)
        self.retries = FilterRetries(
            api=api, reasons=extender.reasons, state=self.state, clock=clock, wall_clock=wall_clock
        )
        binder = Binder(config=config, state=self.state, api=api, events=self.events, wall_clock=wall_clock)
        if config.scheduler.filter_retries:
            self.state.on_freed = self.retries.freed
            binder.on_failed = self.retries.bind_failed
        preempter = Preempter(
            config=config,
            state=self.state,
            events=self.events,
            clock=clock,
            budgets=self.budgets,
            priorities=self.priorities,
            api=api,
        )
        metrics = Metrics(
            self.state,
            clock=clock,
            events=self.events,
            load=load,
            gc=self.gc,
            retries=self.retries,
            dra=self.dra,
        )
        self.self_preemption = SelfPreemption(
            config=config,
            state=self.state,
            api=api,
            events=self.events,
            preempter=preempter,
            priorities=self.priorities,
            reasons=extender.reasons,
            clock=clock,
            retry=self.retries.ask_retry,
            count=lambda outcome: metrics.preemptions.labels("self", outcome).inc(),
        )
        extender.on_shortfall = self.self_preemption.shortfall
        self.services = Services(
            state=self.state,
            extender=extender,
            binder=binder,
            metrics=metrics,
            events=self.events,
            webhook=Webhook(
                config, self.state.quota, templates=self.dra_templates, usage=self.state.dra
            ).handle,
            preempter=preempter,
            load=load,
            dashboard=ui.Dashboard(
                self.state, extender.reasons, clock=clock, preemptions=self.self_preemption, dra=self.dra
            ),
            views=(
                viewaccess.ViewAccess(viewaccess.KubeReviewer(api))
                if config.scheduler.views_auth is ViewsAuth.KUBERNETES
                else None
            ),
        )
        if self.services.dashboard is not None:
            self.self_preemption.on_change = self.services.dashboard.feed.poke
        self.service_log = listener.LimitLog("service", clock=time.monotonic)
        self.extender_log = listener.LimitLog("extender", clock=time.monotonic)
        self.app = build_service_app(self.services, limits=self.limits.service, limit_log=self.service_log)
        self.extender_server = build_extender_server(
            self.services,
            limits=self.limits.extender,
            limit_log=self.extender_log,
            filter_max_body_bytes=self.limits.filter_max_body_bytes,
        )
        self.services.metrics.extender = self.extender_server
        self.extender_address = ""  # 127.0.0.1:port, once started
        self.sites: dict[str, listener.BoundedSite] = {}
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        extender_port: int = 0,
    ) -> str:
        """Start watching and serving: the Service port on ``host:port`` (with ``ssl_context``) and
        the extender on ``127.0.0.1:extender_port`` (plain HTTP). Port 0 picks a free one. Returns
        the Service port's ``host:port``; ``extender_address`` has the extender's."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(inf.run(), name=f"informer-{inf.kind}")
            for inf in (*self.informers, *self.view_informers)
        ]
        self._tasks.append(loop.create_task(self._become_ready(), name="readiness"))
        self._tasks.append(loop.create_task(self.lag_probe.run(), name="loop-lag-probe"))
        self._tasks.append(loop.create_task(self.compact_when_due(), name="gc-compaction"))
        self._tasks.append(loop.create_task(self._self_preemption(), name="self-preemption"))
        address = await self._serve(
            "service",
            self.app,
            host=host,
            port=port,
            limits=self.limits.service,
            limit_log=self.service_log,
            ssl_context=ssl_context,
        )
        # kube-scheduler hanging up (its httpTimeout, or its exit at a leader hand-over) cancels the
        # call: a bind it no longer waits for must not bind the pod later (binder.py)
        self.extender_address = await self.extender_server.start("127.0.0.1", extender_port)
        return address

    def use_ssl_context(self, context: ssl.SSLContext) -> None:
        """New TLS handshakes on the Service port use ``context`` (a reloaded serving certificate);
        open connections keep theirs. Nothing changes on a port served without TLS."""
        site = self.sites.get("service")
        if site is not None and site.ssl_context is not None:
            site.ssl_context = context

    async def _serve(
        self,
        name: str,
        app: web.Application,
        *,
        host: str,
        port: int,
        limits: listener.Limits,
        limit_log: listener.LimitLog,
        ssl_context: ssl.SSLContext | None = None,
    ) -> str:
        # keep-alive timeout: a connection without a complete request head for this long is closed;
        # no lingering: a body is only left unread after a limit hit, and then it is not wanted
        runner = web.AppRunner(
            app,
            access_log=None,
            keepalive_timeout=limits.idle_timeout_s,
            lingering_time=0,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        )
        await runner.setup()
        self._runners.append(runner)
        site = listener.BoundedSite(
            runner, host, port, limits=limits, limit_log=limit_log, ssl_context=ssl_context
        )
        await site.start()
        self.sites[name] = site
        bound_host, bound_port = site.address
        return f"{bound_host}:{bound_port}"

    async def run(
        self,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        extender_port: int = limits_mod.DEFAULT_EXTENDER_PORT,
        on_listening: Callable[[str, str], None] | None = None,
    ) -> None:
        """Serve until cancelled, then tear down (the composition root runs this in a TaskGroup).
        ``on_listening(service_address, extender_address)`` once both listen."""
        try:
            address = await self.start(
                host=host, port=port, ssl_context=ssl_context, extender_port=extender_port
            )
            if on_listening is not None:
                on_listening(address, self.extender_address)
            log.info(
                "serving the webhook and metrics on %s (%s), the extender on %s (http, loopback only)",
                address,
                "https" if ssl_context else "http",
                self.extender_address,
            )
            await asyncio.Event().wait()
        finally:
            await self.stop()

    async def _become_ready(self) -> None:
        await asyncio.gather(*(inf.synced.wait() for inf in self.informers))  # not the views' claims
        # informer callbacks are plain functions: the first lists are applied before synced is seen
        # the synced state is long-lived, and so is most of what comes after: keep it out of the
        # cyclic GC's full scans, which would stall /filter for as long as the state is large
        self.gc.install()
        # that was one full collection over the synced state (seconds, for a large one): not lag
        self.lag_probe.excuse()
        self.services.ready.set()
        log.info("state synced: %d nodes, %d pods; ready", len(self.state.nodes), len(self.state.pods))
        if self.config.scheduler.filter_retries:
            # what kube-scheduler parked while we were away (retries.py, "After a start")
            await self.retries.sweep(self._gpu_pod_of_ours, self.services.refused_before_ready)
            self.services.refused_before_ready.clear()

    def _gpu_pod_of_ours(self, pod: JsonObj) -> bool:
        spec = pod.get("spec")
        if not isinstance(spec, dict) or spec.get("schedulerName") != self.config.scheduler.scheduler_name:
            return False
        try:
            return request.parse_pod(pod, self.config).wants_gpu
        except errors.VgpuError:
            return False  # its /filter reports it

    async def wait_ready(self, timeout_s: float = 10.0) -> None:
        await asyncio.wait_for(self.services.ready.wait(), timeout_s)

    async def _self_preemption(self) -> None:
        """The own preemption path, once the state has synced (a decision on a half-listed
        cluster could evict for room that is already free)."""
        await self.services.ready.wait()
        await self.self_preemption.run()

    async def stop(self) -> None:
        await self.extender_server.stop(timeout_s=SHUTDOWN_TIMEOUT_S)
        for runner in reversed(self._runners):  # the service app's cleanup closes the events recorder
            await runner.cleanup()
        self._runners = []
        self.sites = {}
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self.services.binder.aclose()
        await self.retries.aclose()
        await self.dra_templates.aclose()
        await self.events.aclose()
        self.gc.uninstall()  # hand the frozen objects back to the collector

    async def compact_when_due(self) -> None:
        """Once synced: ``gc_memory_check`` every ``gc_memory_check_s``, ``gc_check`` every
        ``gc_check_s``."""
        await self.services.ready.wait()
        self._gc_seen_calls = self.services.hot_calls
        loop = asyncio.get_running_loop()
        full_at = loop.time() + self._gc_check_s
        while True:
            await asyncio.sleep(max(0.0, min(self._gc_memory_check_s, full_at - loop.time())))
            if loop.time() >= full_at:
                full_at = loop.time() + self._gc_check_s
                self.gc_check()
            else:
                self.gc_memory_check()

    def gc_check(self) -> gcfreeze.Compaction | None:
        """Count the frozen objects (for /metrics too: a walk of every one) and compact them
        (gcfreeze.py) when a compaction is due: when no /filter, /bind, /preempt or /webhook call
        came since the last check and they grew by ``idle_growth`` since the last compaction, so
        that nobody waits on its pause (1 s over 40,000 pods); and, busy or not, when the resident
        set passed its bound or ``overdue_s`` passed (``gc_memory_check``)."""
        calls = self.services.hot_calls
        idle, self._gc_seen_calls = calls == self._gc_seen_calls, calls
        return self._compact(self.gc.due(self._gc_bounds, idle=idle))

    def gc_memory_check(self) -> gcfreeze.Compaction | None:
        """Compact the frozen objects, busy or not, when the resident set grew past its bound
        since the last compaction (``gcfreeze.Bounds``): the cycles that became garbage while
        frozen (a closed connection's, before listener.release) may hold any amount of memory,
        and a scheduler that is never idle must not keep them until it is OOM-killed. Or when
        ``overdue_s`` passed. Two system calls, no walk."""
        return self._compact(self.gc.due(self._gc_bounds))

    def _compact(self, reason: gcfreeze.Reason | None) -> gcfreeze.Compaction | None:
        if reason is None:
            return None
        done = self.gc.compact()
        why = {
            "idle": "idle",
            "memory": "memory grew past its bound",
            "overdue": f"{self._gc_bounds.overdue_s / 3600:g} h since the last compaction",
        }[reason]
        log.info(
            "%s: compacted the frozen objects in %.0f ms: %d cyclic garbage collected, %d -> %d frozen, "
            "%s -> %s MiB resident",
            why,
            done.seconds * 1000,
            done.collected,
            done.frozen_before,
            done.frozen_after,
            _mib(done.rss_before),
            _mib(done.rss_after),
        )
        self.gc_compacted.set()
        return done


def _mib(size: int | None) -> str:
    return "?" if size is None else f"{size / (1 << 20):.0f}"


def _node_ref(node: dict[str, object]) -> dict[str, object]:
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "uid": uid, "namespace": "default"},
    }
