"""Assignment a6_fa2_backward: see README.md here. A package so that every autograder can be named
test_autograder.py."""
