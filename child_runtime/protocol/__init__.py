"""The protocol the trainer and the child share: the boot frame, wire frames and the shared
segment, item checks, reserved exit codes, headers.

May import: the stdlib, numpy and the scorer contract (`scorers.base`, `scorers.common.processes`);
Pillow only where a UniRL request's base64 image is decoded (`unirl`, in the child's parse thread).
The trainer side imports `child_runtime` only through here.
"""
