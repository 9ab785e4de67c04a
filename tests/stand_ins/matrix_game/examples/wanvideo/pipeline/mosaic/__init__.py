"""Stand-in package (tests/stand_ins/matrix_game/README.md)."""
