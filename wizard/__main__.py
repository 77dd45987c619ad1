from nnwizard.cli import main

main()
