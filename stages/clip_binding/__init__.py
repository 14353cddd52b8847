"""clip_binding: how embedding models bind concepts (additivity, binding-function complexity)."""
