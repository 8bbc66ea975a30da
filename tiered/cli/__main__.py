import sys

from tiered.cli.main import main

sys.exit(main())
