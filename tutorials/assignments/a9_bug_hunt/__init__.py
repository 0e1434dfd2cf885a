"""Assignment a9_bug_hunt: see README.md here. A package so that every autograder can be named test_autograder.py."""
