"""unembed_rank: effective rank of the unembedding matrix vs language-model performance.

    python -m stages prepare unembed_rank    # byte-level corpus (stdlib Python = in-domain, C headers = OOD)
    python -m stages train unembed_rank      # grid batch size x weight decay x seed at equal token budget
    python -m stages evaluate unembed_rank   # final losses through the fused linear+CE kernel, geometry, analyses
    python -m stages report unembed_rank     # report.md, claims, figures
"""
