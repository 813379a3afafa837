"""alignflow trainer core."""
