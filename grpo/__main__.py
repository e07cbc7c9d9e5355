import sys

from grpo.cli.main import main

sys.exit(main())
