module github.com/razorbill/flo/services/dispatcher

go 1.26.0
