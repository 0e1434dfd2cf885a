"""Assignment a1_online_softmax: see README.md here. A package so that every autograder can be named
test_autograder.py."""
