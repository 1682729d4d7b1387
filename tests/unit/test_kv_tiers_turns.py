"""bench.kv_tiers' continuation form: a resuming turn is the session's tokens so far."""

from bench.kv_tiers_session import Messages, Turn, continuation_ids


def reply(token_ids: list[int]) -> Turn:
    return Turn(0.0, 0.0, 0, 0, 0, "", token_ids)


def test_a_continuation_is_the_first_message_then_every_reply() -> None:
    messages: Messages = [
        {"role": "user", "content": "log"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "And in two words?"},
    ]

    def encode(ms: Messages) -> list[int]:
        return [len(ms), *(len(m["content"]) for m in ms)]

    ids = continuation_ids(messages, encode, [reply([5, 6]), reply([7])])
    # only the first message is rendered: the later questions add no tokens
    assert ids == [1, 3, 5, 6, 7]
    assert continuation_ids(messages[:1], encode, []) == [1, 3]
