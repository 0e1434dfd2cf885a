"""Assignment a7_block_sparse: see README.md here. A package so that every autograder can be named
test_autograder.py."""
