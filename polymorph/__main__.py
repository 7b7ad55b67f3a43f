import sys

from polymorph.cli import main

sys.exit(main())
