"""reversal_curse — breaking the reversal curse with the Identity Bridge (one-layer models).

    dvc repro report@reversal_curse                       # default profile
    python -m stages train reversal_curse --profile smoke # one stage, seconds
"""
