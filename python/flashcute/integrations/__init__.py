"""Adapters that plug flashcute into other libraries.

Each adapter is its own module and imports its library only when it is imported itself, so
`import flashcute` (or this package) pulls in none of them:
  flashcute.integrations.transformers  Hugging Face transformers 5: register() adds
                                       attn_implementation="cute_attention".
"""
