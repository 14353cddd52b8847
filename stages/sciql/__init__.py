"""SCIQL — Style-Conditioned Implicit Q-Learning (offline RL that follows commanded styles), in miniature."""
