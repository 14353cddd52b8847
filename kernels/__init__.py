"""Triton kernels, each beside its pure-torch reference and a dispatcher.

A kernel module ``kernels/<name>.py`` holds the Triton kernel(s), a ``*_reference`` torch
function computing the same thing, a public function that dispatches between them
(``backend="auto"``: Triton on CUDA or under ``TRITON_INTERPRET=1``, else the reference), and
``BENCHMARKS`` cases for ``python -m kernels.bench``. Set ``TRITON_INTERPRET=1`` *before*
importing a kernel module to run its Triton path on the CPU (tests do this).
"""
