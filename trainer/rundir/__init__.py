"""The run directory's one owner: its lock, atomic writes, checksums, free space, backups,
the checks that a rerun may resume, and checkpoint verification.

May import `config/` only.
"""
