"""``SentBindings``: which Bindings a pods list settles (sent before it began, pod not listed)."""

from vgpu_scheduler.sentbindings import SentBindings


def test_a_list_settles_only_the_bindings_sent_before_it_whose_pods_it_does_not_hold() -> None:
    sent = SentBindings()
    sent.sent("gone", "n1")
    sent.sent("listed", "n2")
    sent.listing()
    sent.sent("newer", "n3")  # sent after the list began: its pod may be newer than the list
    assert sent.gone(["listed"]) == [("gone", "n1")]
    assert "gone" not in sent and "listed" in sent and sent.node("newer") == "n3"
    assert sent.gone([]) == []  # no list under way: nothing settled


def test_drop_forgets_a_binding_and_an_unknown_uid_is_no_error() -> None:
    sent = SentBindings()
    assert not sent and sent.node("p") is None
    sent.sent("p", "n1")
    sent.drop("p")
    sent.drop("never-sent")
    assert not sent and "p" not in sent
