"""The trainer contract in process: requests and responses, panels, groups, identity, config, the
service, the submission queue, retries, and the floor plan of the code itself.
"""
