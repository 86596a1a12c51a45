"""swag"""
