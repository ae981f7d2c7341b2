module github.com/razorbill/flo-go

go 1.26.0
