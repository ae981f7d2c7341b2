module github.com/razorbill/flo/examples/quickstart

go 1.26.0
