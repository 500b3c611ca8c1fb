"""``SentBindings``: the Bindings this scheduler has sent that the pods watch has not shown yet.

From the moment the binder sends a pod's Binding until the watch shows the pod bound or gone, or
the Binding is refused (the bind rolls back), the Binding may take effect at any moment: the
cluster state keeps the pod's decision (it neither expires nor is released) and refuses to place
the pod again. A pod bound and deleted while the pods watch was down is never seen by the watch
(a re-list reports deletions only of the pods it held), so a pods list asked for after its Binding
was sent that does not hold the pod settles it: Bindings sent and lists asked for are counted in
one sequence of turns, in the order they happen here.
"""

import itertools
from collections.abc import Iterable


class SentBindings:
    """uid -> (turn, node) of each Binding on its way; see the module docstring."""

    def __init__(self) -> None:
        self._sent: dict[str, tuple[int, str]] = {}
        self._turns = itertools.count()
        self._listing_since: int | None = None  # the turn of the pods list under way

    def __contains__(self, uid: object) -> bool:
        return uid in self._sent

    def __bool__(self) -> bool:
        return bool(self._sent)

    def node(self, uid: str) -> str | None:
        """The node pod ``uid``'s Binding on its way names, or None."""
        sent = self._sent.get(uid)
        return None if sent is None else sent[1]

    def sent(self, uid: str, node: str) -> None:
        """The binder is sending pod ``uid``'s Binding to ``node``: from now until the watch shows
        the pod bound or gone, or ``drop``, the state keeps its decision (it does not expire,
        ``ClusterState.release`` leaves it) and ``ClusterState.bound_problem`` says so (a re-filter
        or a second bind is refused)."""
        self._sent[uid] = (next(self._turns), node)

    def drop(self, uid: str) -> None:
        """Pod ``uid``'s Binding is no longer on its way: refused (the bind rolls back), shown
        bound by the watch, or its pod is gone."""
        self._sent.pop(uid, None)

    def listing(self) -> None:
        """The pods informer is about to list (its first list, or a re-list after a lost watch)."""
        self._listing_since = next(self._turns)

    def gone(self, listed: Iterable[str]) -> list[tuple[str, str]]:
        """The list asked for at ``listing`` holds the pods ``listed`` (uids): forget the Bindings
        sent before it began whose pods it does not hold, and return them as (uid, node). A Binding
        sent after the list began is kept (its pod may be newer than the list)."""
        since, self._listing_since = self._listing_since, None
        if since is None or not self._sent:
            return []
        held = set(listed)
        gone = [(uid, node) for uid, (turn, node) in self._sent.items() if turn < since and uid not in held]
        for uid, _ in gone:
            del self._sent[uid]
        return gone
