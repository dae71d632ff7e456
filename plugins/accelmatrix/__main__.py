import sys

from accelmatrix.cli import main

sys.exit(main())
