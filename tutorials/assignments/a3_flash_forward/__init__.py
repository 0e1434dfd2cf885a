"""Assignment a3_flash_forward: see README.md here. A package so that every autograder can be named
test_autograder.py."""
