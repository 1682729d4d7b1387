"""A model's text side and shape, all the gateway needs of the engine: the GGUF header, the
model's shape (ModelConfig), the tokenizer and detokenizer, chat templates and tools, and
the text stream of a generation. Nothing here computes with the weights."""
