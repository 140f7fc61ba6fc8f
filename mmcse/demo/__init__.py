"""``mmcse demo``: the whole job, offline, on a drawn grounded world (an app)."""
