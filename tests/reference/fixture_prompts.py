"""The prompts of the reference_logits.npz fixture and the conversations of greedy_chats.json."""

from __future__ import annotations

CODE_PROMPT = (
    "def is_prime(n):\n"
    "    if n < 2:\n"
    "        return False\n"
    "    for i in range(2, int(n ** 0.5) + 1):\n"
    "        if n % i == 0:\n"
    "            return"
)

LOGIT_CHAT = [
    {
        "role": "system",
        "content": (
            "You are a concise assistant that answers questions about computer "
            "science in one or two clear sentences."
        ),
    },
    {
        "role": "user",
        "content": (
            "Explain what a hash table is, and why looking up a key in it is usually "
            "fast even when it holds millions of entries."
        ),
    },
]

CHATS: list[tuple[str, list[dict[str, str]]]] = [
    (
        "capital_no_system",
        [
            {"role": "user", "content": "What is the capital of France?"},
        ],
    ),
    (
        "capital_with_system",
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of Japan?"},
        ],
    ),
    (
        "python_square",
        [
            {
                "role": "user",
                "content": "Write a Python function that returns the square of a number.",
            },
        ],
    ),
    (
        "python_is_even",
        [
            {"role": "user", "content": "Write a Python function to check if a number is even."},
        ],
    ),
    (
        "c_hello_system",
        [
            {"role": "system", "content": "You are a coding assistant."},
            {"role": "user", "content": "Write a hello world program in C."},
        ],
    ),
    (
        "fix_code",
        [
            {
                "role": "user",
                "content": (
                    "Fix this Python code:\n\n```python\ndef add(a, b)\n    return a + b\n```"
                ),
            },
        ],
    ),
    (
        "multi_turn",
        [
            {"role": "user", "content": "Hi! What's your name?"},
            {
                "role": "assistant",
                "content": "Hello! I'm SmolLM, an AI assistant. How can I help you today?",
            },
            {"role": "user", "content": "Can you tell me a fun fact about octopuses?"},
        ],
    ),
    (
        "multi_turn_system",
        [
            {"role": "system", "content": "You are a math tutor."},
            {"role": "user", "content": "What is 12 times 12?"},
            {"role": "assistant", "content": "12 times 12 is 144."},
            {"role": "user", "content": "And what is 144 divided by 3?"},
        ],
    ),
    (
        "color_sky",
        [
            {"role": "user", "content": "Why is the sky blue?"},
        ],
    ),
    (
        "long_question",
        [
            {
                "role": "system",
                "content": "You are a helpful assistant who gives practical advice.",
            },
            {
                "role": "user",
                "content": (
                    "I am planning a trip to Italy next spring with my family. We have two "
                    "children, aged seven and ten, and we would like to visit Rome, Florence and "
                    "Venice in about ten days. We enjoy history, food and walking, but the kids "
                    "get tired easily. Could you suggest how we should split our time between the "
                    "three cities, and what we should not miss?"
                ),
            },
        ],
    ),
    (
        "photosynthesis",
        [
            {"role": "user", "content": "Explain photosynthesis to a ten-year-old."},
        ],
    ),
    (
        "git_status",
        [
            {"role": "user", "content": "What does the `git status` command do?"},
        ],
    ),
]
