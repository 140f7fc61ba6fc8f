"""What a researcher reads: comparison tables, published numbers, plots, exported models, overviews."""
