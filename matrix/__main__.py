from matrix.run import main

main()
