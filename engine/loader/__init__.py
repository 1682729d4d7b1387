"""A GGUF file's compute side read into memory: its tensors checked against the model's
shape, placed as the forward pass wants them (weights), and its RoPE frequency factors."""
