"""Running jobs on a Ray cluster through the Ray Jobs API, without the command line around it.

``auth`` finds the cluster's token, ``package`` stages the working directory and the job file that get
uploaded, ``entrypoint`` is the command the cluster runs in it, and ``jobs_client`` submits, follows and
stops jobs. The ``submit``/``status``/``logs``/``stop`` commands (pipeline/cli/cluster.py) turn their
errors into exit codes. Ray is imported only when a client connects, so importing these stays fast.
"""
