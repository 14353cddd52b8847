"""Shared machinery every paper uses: configs, paths, seeding, Trainer factory, tracking,
the tiny transformer, claims and reporting."""
