"""Slide decks, one per lab: Markdown sources built into offline HTML (see build.py)."""
