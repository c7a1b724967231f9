"""A job on a Slurm site: the allocation's steps, the batch step's account, the login host's verbs.
"""
