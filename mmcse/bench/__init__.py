"""``mmcse bench``: every speed figure of the toolkit (an app: it may import both stages)."""
