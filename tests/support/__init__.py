"""Builders and helpers the test modules share (tests never import each other)."""
