module github.com/razorbill/flo/services/gateway

go 1.26.0
