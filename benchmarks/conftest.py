import os
import sys

# The harness is imported as a plain module by the bench files.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
