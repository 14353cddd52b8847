"""Paper pipelines: one package per paper (``stages/<slug>/``) plus ``stages/common``."""
