"""The model families: one module each, composing the shared operations (engine/ops) into
its decoder layer and saying what the loader and the forward pass need to know of it
(family.py). families.py lists them."""
