"""Temporal activities: the side-effecting steps of a session. Each takes one contract dataclass and
returns one. Domain errors are translated to `ApplicationError` here and nowhere else."""
