"""The watch between the job's supervisors: the authenticated wire and its messages, the listener, the member, the hub's
host, the supervisor that holds them, hub succession.
"""
