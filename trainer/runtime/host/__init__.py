"""This node's side: its trainer processes (started, watched, stopped), their channel and heartbeats, the node's state
file, its network facts.
"""
