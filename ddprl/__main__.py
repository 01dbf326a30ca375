import sys

from ddprl.cli import main

if __name__ == "__main__":
    sys.exit(main())
