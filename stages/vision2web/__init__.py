"""vision2web: hierarchical visual website-development benchmark (L1 static, L2 interactive, L3 full stack)
with a real Chromium GUI verifier and a segmented visual judge. Task format: README.md beside this file."""
