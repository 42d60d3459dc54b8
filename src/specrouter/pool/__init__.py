"""The demo model pool: a family of small Llama models that share one tokenizer.

The pool is trained by the project itself on the Python standard library's source, so that the
system can be seen working on any machine with no model hub in reach (`specrouter train-pool`).
"""
