"""Chat templates render as transformers renders them, and bad input is refused."""

import json

import pytest

from common.errors import InvalidRequestError
from engine.text.chat import render_chat

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


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}  # fmt: skip
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL, {**CALL, "id": "c2"}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "rain"},
]


def test_a_template_without_tools_gets_them_as_text():
    out = render_chat(CHATML, TOOL_CHAT, tools=[WEATHER])
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    system, rest = out.split("<|im_end|>\n", 1)
    # the tools after a system message of their own (the template's default one is replaced)
    assert system.startswith("<|im_start|>system\n# Tools\n")
    assert f"<tools>\n{json.dumps(WEATHER)}\n</tools>" in system
    assert "<tool_call>" in system and "SmolLM" not in out
    assert rest == (
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        f"<|im_start|>assistant\n{block}\n{block}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nrain\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_tools_follow_a_given_system_message():
    chat = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    out = render_chat(CHATML, chat, tools=[WEATHER])
    assert out.startswith("<|im_start|>system\nBe terse.\n\n# Tools\n")
    assert render_chat(CHATML, chat, tools=[]) == render_chat(CHATML, chat)


def test_a_template_that_reads_tools_renders_them_itself():
    template = (
        "{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% for c in m.tool_calls or [] %}"
        "<{{ c.function.name }} {{ c.function.arguments | tojson }}>"
        "{% endfor %}{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %};{% endfor %}"
    )
    out = render_chat(template, TOOL_CHAT, tools=[WEATHER], add_generation_prompt=False)
    assert out == (
        '[get_weather]user:Weather in Paris and Rome?;assistant:<get_weather {"city": "Paris"}>'
        '<get_weather {"city": "Paris"}>;tool:sunny(c1);tool:rain(c2);'
    )


@pytest.mark.parametrize(
    ("tools", "messages", "field", "problem"),
    [
        ([{"type": "function"}], TOOL_CHAT[:1], "tools", "[0]: must be"),
        ([{"type": "function", "function": {"name": ""}}], TOOL_CHAT[:1], "tools", "name"),
        ([{**WEATHER, "function": {"name": "f", "parameters": 3}}], TOOL_CHAT[:1], "tools",
         "parameters"),
        ("f", TOOL_CHAT[:1], "tools", "must be a list"),
        (None, [{"role": "user", "content": "a", "tool_calls": [CALL]}], "messages",
         "[0].tool_calls: only on assistant"),
        (None, [{"role": "assistant", "content": "", "tool_calls": []}], "messages",
         "non-empty list"),
        (None, [{"role": "assistant", "content": "",
                 "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}], "messages",
         "arguments: must be an object"),
    ],
)  # fmt: skip
def test_bad_tools_name_the_field(tools, messages, field, problem):
    with pytest.raises(InvalidRequestError) as info:
        render_chat(CHATML, messages, tools=tools)
    assert info.value.field == field
    assert problem in str(info.value)


def test_a_template_with_loop_controls_is_seen_to_read_tools():
    # {% break %} needs the loopcontrols extension: read with the environment that renders
    template = (
        "{% for t in tools %}{{ t.function.name }}{% break %}{% endfor %}|"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    out = render_chat(
        template, TOOL_CHAT[:1], tools=[WEATHER, WEATHER], add_generation_prompt=False
    )
    assert out == "get_weather|Weather in Paris and Rome?"
