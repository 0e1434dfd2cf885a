"""Assignment a2_tiled_matmul: see README.md here. A package so that every autograder can be named
test_autograder.py."""
