from nnwizard.launch import main

main()
