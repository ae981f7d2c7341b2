module github.com/razorbill/flo-go/cmd/flo

go 1.26.0
