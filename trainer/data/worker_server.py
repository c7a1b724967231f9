"""The fork server's first import: trainer.data.loader.worker_context starts the server with this module as its
preload, and nothing else imports it. It imports the loader workers' modules once, so each worker forks ready, and
ties the server's life to the training process that started it.

A worker's parent is the server, not the training process. Torch's workers end when their parent is gone, and the
server ends when its last client has, which its workers are: left so, a training process killed outright would leave
its server and its workers behind for ever. The kernel kills the server when the training process ends, however it
ends; its workers then see their parent gone at their next status check (torch's, every 5 s) and end.
"""

import os

from trainer.data import loader  # noqa: F401  (the workers' code)
from trainer.data.timelimit import die_with_parent

die_with_parent(os.getppid())
