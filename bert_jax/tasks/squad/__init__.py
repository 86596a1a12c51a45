"""squad"""
