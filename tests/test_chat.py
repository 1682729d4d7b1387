"""Chat templates render as transformers renders them, and bad input is refused."""

import pytest

from common.errors import InvalidRequestError
from engine.chat import render_chat

# tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf.
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_default_system_message_is_added():
    messages = [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 2+2?"},
    ]
    assert render_chat(CHATML, messages) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello!"
        "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_given_system_message_without_generation_prompt():
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert render_chat(CHATML, messages, add_generation_prompt=False) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_trim_blocks_and_tojson_follow_transformers():
    template = "{% for m in messages %}\n  {{ m | tojson }}\n{% endfor %}{{ bos_token }}"
    out = render_chat(template, [{"role": "user", "content": "<a & 'b'> é"}], bos_token="<s>")
    # trim_blocks eats the newline after a block tag; lstrip_blocks leaves indents before {{ }}.
    assert out == '  {"role": "user", "content": "<a & \'b\'> é"}\n<s>'


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([], "non-empty list"),
        ("hi", "non-empty list"),
        ([{"role": "user", "content": "a"}, "b"], "[1]: must be an object"),
        ([{"content": "a"}], "[0].role: must be a string, not missing"),
        ([{"role": "user", "content": "a"}, {"role": "bogus", "content": "b"}], "'bogus'"),
        ([{"role": "user", "content": None}], "[0].content: must be a string"),
        ([{"role": "user", "content": ["a"]}], "[0].content: must be a string, not list"),
    ],
)
def test_bad_messages_name_the_field(messages, problem):
    with pytest.raises(InvalidRequestError) as info:
        render_chat(CHATML, messages)
    assert info.value.field == "messages"
    assert problem in str(info.value)


def test_raise_exception_in_template_is_an_invalid_request():
    template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(InvalidRequestError, match="roles must alternate") as info:
        render_chat(template, [{"role": "user", "content": "a"}])
    assert info.value.field == "messages"


@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}",  # does not compile
        "{{ messages.append(1) }}",  # the sandbox refuses to mutate
        "{{ messages[0]['content'] + 1 }}",  # TypeError inside the template
    ],
)
def test_template_failures_are_invalid_requests(template):
    with pytest.raises(InvalidRequestError):
        render_chat(template, [{"role": "user", "content": "a"}])
